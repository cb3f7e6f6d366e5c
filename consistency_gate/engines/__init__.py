"""Where the counting runs: in this process (streaming files) or on Spark (the same counts, merged)."""
