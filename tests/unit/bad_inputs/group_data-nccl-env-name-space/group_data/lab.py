cluster = "lab"
fabric_subnet = "10.0.0.0/24"
nccl_env_overrides = {"NCCL IB HCA": "mlx5"}
