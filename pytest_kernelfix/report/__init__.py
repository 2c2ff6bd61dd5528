"""What a session leaves behind: patches, each round's prompt and answer, report.json and
report.md, CI outputs, and the healed files in apply mode."""
