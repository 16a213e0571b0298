"""Service-level objectives: good and total events per objective, burn rates and budgets."""
