"""kit's hygiene leaves (issue 27), standard library only (the supervise bundle carries them):
`kit.safe.text` makes outside text safe to show and save (redaction, terminal-safe, strict
JSON); `kit.safe.files` writes in shared folders without following planted links (the one
atomic write, no-follow opens, locked record updates)."""
