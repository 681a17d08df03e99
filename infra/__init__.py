"""Development infrastructure; a package so the integration tests can import `infra.local`."""
