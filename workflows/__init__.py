"""The workflows of durable-sse, as the repository's layout names them.

They live in :mod:`durable_sse.workflows` (an installed durable-sse adds no ``workflows``
package to site-packages, where an application's own would collide with it); this folder
is not installed and re-exports them for code that runs from a checkout.
"""

from durable_sse.workflows import *  # noqa: F403 - the same names, one list
from durable_sse.workflows import __all__ as __all__
