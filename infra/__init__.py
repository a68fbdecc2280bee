"""Infrastructure as code: the CloudFormation template and the code that deploys it."""
