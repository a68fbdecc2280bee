"""The network an ECS stack (EnableEcs=true) is deployed into, made in moto: moto checks that the
VPC, subnets and security groups the load balancer, the database subnet group and the services name
exist, as AWS does."""

from __future__ import annotations

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/groundskeeper:test"
ACCESS_CIDR = "10.0.0.0/8"  # WebserverAccessCidr: e.g. the VPN's range
# The webserver's login: the HTTPS listener's certificate and an OpenID Connect identity provider.
LOGIN = {
    "WebserverCertificateArn": "arn:aws:acm:us-east-1:123456789012:certificate/0f0e0d0c-0b0a-0908-0706-050403020100",
    "OidcIssuer": "https://login.example.com",
    "OidcAuthorizationEndpoint": "https://login.example.com/authorize",
    "OidcTokenEndpoint": "https://login.example.com/token",
    "OidcUserInfoEndpoint": "https://login.example.com/userinfo",
    "OidcClientId": "dagster-ui",
    "OidcClientSecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:groundskeeper/oidc-AbCdEf",
}


def make_network(ec2, second_octet: int) -> tuple[str, list[str]]:
    """A VPC 10.<second_octet>.0.0/16 with a subnet in each of two Availability Zones: (vpc id, subnet ids)."""
    vpc = ec2.create_vpc(CidrBlock=f"10.{second_octet}.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.{second_octet}.{i}.0/24", AvailabilityZone=f"us-east-1{zone}")[
            "Subnet"
        ]["SubnetId"]
        for i, zone in enumerate("ab")
    ]
    return vpc, subnets


def ecs_parameters(vpc: str, subnets: list[str], **more: str) -> dict[str, str]:
    """The parameters of a complete EnableEcs=true deploy (the stack creates its database unless
    ``more`` names an existing one)."""
    return {
        "EnableEcs": "true",
        "EcsImage": IMAGE,
        "EcsVpcId": vpc,
        "EcsSubnets": ",".join(subnets),
        "WebserverAccessCidr": ACCESS_CIDR,
        **more,
    }
