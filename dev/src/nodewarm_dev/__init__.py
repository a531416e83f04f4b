"""nodewarm's local test environment and `nodewarm demo`: develops and demonstrates the product, never ships in it."""
