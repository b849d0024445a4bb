"""trainkit's TensorBoard tab: step breakdown, findings, ablation and traces of each run.

TensorBoard finds it through the ``tensorboard_plugins`` entry point (``setup.cfg``) once trainkit
is installed; without installing, pass it yourself::

    from tensorboard import default, program
    tb = program.TensorBoard(plugins=default.get_plugins() + [TrainkitPluginLoader()])

Importing this package is cheap: no torch, no event reading until a request comes.
"""
from .plugin import PLUGIN_NAME, TrainkitPlugin, TrainkitPluginLoader

__all__ = ["PLUGIN_NAME", "TrainkitPlugin", "TrainkitPluginLoader"]
