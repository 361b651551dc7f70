cluster = "lab"
fabric_subnet = "10.0.0.0/24"
image_id = "4f1c9e0d2a7b"
