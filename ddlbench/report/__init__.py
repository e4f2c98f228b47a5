"""HTML reports rendered from the aggregate table; no torch, nothing fetched from the network."""
