"""The deploys: one serve flow for a host and a whole box, the compare/tune frame, the fleet
rollout."""
