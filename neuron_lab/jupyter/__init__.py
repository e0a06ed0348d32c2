"""Layer 4, Jupyter: magics, the side panel's comm endpoint, ipywidgets views.

``protocol`` (the comm schema), ``comm`` (the endpoint), ``magics``, ``views`` (rich tables),
``dashboard`` (ipywidgets; ``neuron_lab.dashboard()``), ``extension`` (``%load_ext neuron_lab``).
"""
