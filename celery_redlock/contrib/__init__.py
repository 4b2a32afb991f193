"""Optional integrations, imported only when used: :mod:`.prometheus`, :mod:`.eventlog`."""
