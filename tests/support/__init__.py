"""What the tests share: builders of cluster objects, fixtures, the fault proxy, the checkout's paths."""
