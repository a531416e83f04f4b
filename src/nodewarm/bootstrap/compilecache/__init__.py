"""Compile caches (vLLM, Inductor, Triton, precompiled headers) shared between nodes as signed bundles:
the key (cachekey), the archive (bundle), the bucket (cachestore), signatures (signing), publish,
restore, the hit check (hitcheck) and their CLI (cli)."""
