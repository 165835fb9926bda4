"""Routing: the rule table, the fleet of agents and the choice among them, the router
that dispatches, and reloading the rules without a restart."""
