"""``latsim client``: a viewer that measures L end to end (:mod:`~harness.viewer.client`)."""
