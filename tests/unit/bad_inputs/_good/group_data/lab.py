cluster = "lab"
# Legitimate but unusual: a /8 fabric, a node far from the other in it, a user with '.', '_' and '-'.
fabric_subnet = "10.0.0.0/8"
model = "org/tiny"
lane = "tiny"
model_revision = "0123456789abcdef0123456789abcdef01234567"
