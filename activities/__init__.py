"""The activities of durable-sse, as the repository's layout names them.

They live in :mod:`durable_sse.activities` (an installed durable-sse adds no ``activities``
package to site-packages, where an application's own would collide with it); this folder
is not installed and re-exports them for code that runs from a checkout.
"""

from durable_sse.activities import *  # noqa: F403 - the same names, one list
from durable_sse.activities import __all__ as __all__
