"""The operator's live view: ``reach dashboard`` (a web page, no build step, no CDN) and
``reach top`` (the same essentials in a terminal).

- :mod:`.views`: what is shown, kept current from the broker (read only);
- :mod:`.history`: the five metrics over time, from the dashboard's own fold of the events;
- :mod:`.alerts`: the rules of ``alerts.yml`` for those five, judged over that history;
- :mod:`.sections`, :mod:`.trace`: the snapshot's sections and a message's stages as JSON;
- :mod:`.server`: the HTTP API and the page (``index.html``); :mod:`.top`: the terminal;
- :mod:`.hosts`: the ``Host`` names it answers to (against DNS rebinding);
- :mod:`.access`: the access token it asks of every request (against other local processes).
"""

from agentreach.dashboard.access import valid_token
from agentreach.dashboard.history import History
from agentreach.dashboard.hosts import AllowedHosts
from agentreach.dashboard.server import DashboardApp
from agentreach.dashboard.top import render
from agentreach.dashboard.views import Board

__all__ = ["AllowedHosts", "Board", "DashboardApp", "History", "render", "valid_token"]
