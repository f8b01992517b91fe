"""What a store is: the protocols and their value types."""
