"""Learning algorithm: V-trace off-policy correction and the APPO loss."""
