"""The frozen target: the target model by name (load), the embedded SmolLM2-135M target (smollm2) and the corpus of
its own continuations and features (corpus)."""
