"""Ready operators."""
