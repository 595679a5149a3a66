"""Linear models on the PS beside logistic regression: MLlib's LinearRegression (squared
error, huber) and LinearSVC (hinge), fitted with the LR solver and PS vector machinery."""
