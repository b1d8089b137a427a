"""Experiments: the paper's pipeline run end to end on the embedded target, stage by stage, each stage cached
(demo.py: `dcoco demo`; report.py: its JSON's headline, table and plots). The studies under bench/ build on
this layer's public names."""
