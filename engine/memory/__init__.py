"""A rank's memory: the slab its weights and pools are packed into, the address range under it, the KV and state
pools, the ladder's arena and host images, device readings, and the checksums that check weights where they lie."""
