"""memalloc's figures in the training frameworks' own loggers: a Lightning
callback (:mod:`memalloc.integrations.lightning`, ``MemoryMonitor``) and a
transformers ``TrainerCallback`` (:mod:`memalloc.integrations.transformers`,
``MemoryCallback``). Each module imports its framework at its top, so import
the one you use; ``import memalloc`` imports neither framework."""
