"""The gate: its config and rules (value objects that check themselves), and the gate run."""
