"""Model zoo: one builder module per family, registered by name."""
