"""The `fleetfence` command line, the top of the house: it composes every component (the demo,
the services, the embedded infrastructure) and nothing imports it. `cli.app:app` is the console
script; a module per command group registers its commands on the one root app."""
