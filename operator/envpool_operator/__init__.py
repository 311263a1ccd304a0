"""EnvPool operator."""
