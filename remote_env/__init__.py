"""remote_env."""
