"""`python -m fleetfence`: the same as the `fleetfence` console script."""

from fleetfence.cli import app

app()
