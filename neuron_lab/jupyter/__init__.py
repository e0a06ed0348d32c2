"""Layer 4, Jupyter: magics, the side panel's comm endpoint, ipywidgets views.

``protocol`` (the comm schema), ``comm`` (the endpoint), ``magics``, ``views`` (rich tables),
``dashboard`` (ipywidgets), ``extension`` (``%load_ext neuron_lab``).
"""


def dashboard(*args, **kwargs):
    from .dashboard import dashboard as _dashboard
    return _dashboard(*args, **kwargs)
