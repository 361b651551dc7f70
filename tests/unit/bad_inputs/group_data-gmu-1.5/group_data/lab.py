cluster = "lab"
fabric_subnet = "10.0.0.0/24"
gpu_memory_utilization = 1.5
