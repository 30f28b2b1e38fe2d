"""The sidecar agent: finds the vLLM processes it can see and reports their evidence."""
