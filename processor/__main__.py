"""`python -m processor`: the processor service (same as `fleetfence processor`)."""

from fleetfence.logs import configure_logging
from processor.ops.service import serve
from processor.settings import ProcessorSettings

if __name__ == "__main__":
    settings = ProcessorSettings()
    configure_logging(settings.log_level, settings.log_json)
    serve(settings)
