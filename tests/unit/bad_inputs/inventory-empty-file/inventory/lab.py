"""Bad-input corpus: an inventory someone has not filled in yet."""
