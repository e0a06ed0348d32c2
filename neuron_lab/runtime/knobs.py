"""The runtime's knobs (ContextVar/env pairs, see ``neuron_lab.device.config.Knob``)."""
from ..device.config import Knob

MODE = Knob("NEURON_LAB_MODE", "adaptive", str, choices=("eager", "adaptive"),
            doc="adaptive: queue, cache and fuse op sequences; eager: launch every op")
