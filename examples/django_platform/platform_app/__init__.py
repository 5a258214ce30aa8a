"""The platform's own app (label ``platform``): its jobs and usage logs, and the views."""
