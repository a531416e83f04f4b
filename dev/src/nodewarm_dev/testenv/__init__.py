"""The local stand-ins for a cluster and AWS that the tests and the demo run against (docs/testing.md)."""
