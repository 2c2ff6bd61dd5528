"""What a session leaves behind: patches, report.json and report.md, CI outputs, and the
healed files in apply mode."""
