cluster = "lab"
fabric_subnet = "10.0.0.0/24"
model = "org/tiny"
lane = "tiny"
