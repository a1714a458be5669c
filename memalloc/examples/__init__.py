"""Example user code that ships with memalloc (the demo's leak hunt). Files
here count as user code in stacks and leak reports, unlike the rest of the
memalloc package."""
