cluster = "lab"
fabric_subnet = "10.0.0.0/24"
fabric_twin_subnet = "10.0.0.128/25"
