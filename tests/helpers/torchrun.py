"""What each rank of a `dcoco train` torchrun test runs."""

# `dcoco train` under torchrun: each rank writes rank<R>.txt (a hash of the trained weights and the backend) and,
# with online features, rank<R>.target (what the target's weights became: Parameter, or DTensor when sharded)
WRAPPER = """
import hashlib, sys, torch, torch.distributed as dist
from dcoco.ops import backend
from dcoco import cli
from dcoco.cli import train_cmd
from dcoco.target import features
from dcoco.train import recipe
init = features.TargetFeatures.__init__
def spy(self, *a, **k):
    init(self, *a, **k)
    w = type(self.decoder.layers[0].mlp.up_proj.weight).__name__
    open(f"{sys.argv[1]}/rank{dist.get_rank()}.target", "w").write(w)
features.TargetFeatures.__init__ = spy
cfg, kw = train_cmd.train_options(cli.parser().parse_args(sys.argv[2:]))
res = recipe.run(cfg, **kw)
h = hashlib.sha256()
for m in (res.drafter, res.corrector):
    for v in m.state_dict().values():
        h.update(v.detach().cpu().numpy().tobytes())
open(f"{sys.argv[1]}/rank{dist.get_rank()}.txt", "w").write(h.hexdigest() + " " + backend.resolve("cpu")[0])
"""
