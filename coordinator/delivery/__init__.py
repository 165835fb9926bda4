"""Delivery: acting on what agents report (retry with backoff, or dead-letter), JetStream
max-delivery advisories, and the one way a task ends badly."""
