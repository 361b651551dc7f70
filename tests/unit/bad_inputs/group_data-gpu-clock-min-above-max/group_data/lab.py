cluster = "lab"
fabric_subnet = "10.0.0.0/24"
gpu_clock_cap = "2150,200"
