cluster = "lab"
fabric_subnet = "10.0.0.0/24"
nccl_env = {"NCCL_IB_DISABLE": 0}
