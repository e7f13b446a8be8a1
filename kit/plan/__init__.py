"""Pure planning: config + role + host facts -> container spec, scripts, argv. No I/O here."""
