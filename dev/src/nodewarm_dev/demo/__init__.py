"""`nodewarm demo`: the whole product on one machine, on embedded defaults, without AWS."""
