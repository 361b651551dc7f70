cluster = "lab"
fabric_subnet = "10.0.0.0/24"
nccl_version = "2.30"
