"""`dcoco train` and `dcoco data`: the training loop (training), online target features (online), the frozen-drafter
contract (frozen), the memory plan (memplan), the pipeline (recipe), finished stages and their lineage (stages) and data
generation through a server (datagen)."""
