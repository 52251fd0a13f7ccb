"""remedies."""
