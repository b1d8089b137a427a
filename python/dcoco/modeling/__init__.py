"""The models around the corrector: the DFlash drafter (dflash), the chunked LM head (head), DFlash2's candidate
selector (selector) and the serving checkpoint layout (checkpoint)."""
