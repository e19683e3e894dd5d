"""What the user sees: plan and status text, notebook views, the report, metrics, goodput, doctor."""
